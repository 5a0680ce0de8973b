"""``vllm bench serve --dataset-name burstgpt``: the BurstGPT trace's GPT-4
rows (``Timestamp,Model,Request tokens,Response tokens,...``)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from kvsched.errors import UserInputError
from kvsched.jsonfile import show
from kvsched.sim.workload.bench.sample import BenchSample
from kvsched.sim.workload.limits import MAX_ARRIVAL_TIME, MAX_REQUEST_TOKENS
from kvsched.sim.workload.tokenizer import TextTokenizer
from kvsched.sim.workload.traces.source import Source, read_text

# vLLM reads the columns by position: the request's tokens are the third,
# its response's the fourth.
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")


def read_burstgpt(path: str | Path) -> list[tuple[float, int, int]]:
    """(timestamp, request tokens, response tokens) of the rows vLLM keeps:
    Model ``GPT-4`` and a response of at least one token, in file order."""
    p, text = read_text(path)
    src = Source(p)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise UserInputError(f"{p}: empty file; expected the header "
                             f"{','.join(BURSTGPT_COLUMNS)},...") from None
    except csv.Error as e:
        raise src.error(1, f"not valid CSV: {e}") from None
    if tuple(h.strip() for h in header[:4]) != BURSTGPT_COLUMNS:
        raise src.error(1, f"header {show(','.join(header), 200)}: BurstGPT's columns start "
                        f"{','.join(BURSTGPT_COLUMNS)} (vLLM reads them by position)")
    rows = []
    try:
        for fields in reader:
            if not fields:
                continue
            line = reader.line_num
            if len(fields) < 4:
                raise src.error(line, f"{len(fields)} fields; BurstGPT rows have at least 4")
            if fields[1] != "GPT-4":
                continue
            response = _number(src, line, "Response tokens", fields[3])
            if not response > 0:
                continue
            request = _number(src, line, "Request tokens", fields[2])
            stamp = _number(src, line, "Timestamp", fields[0])
            for column, value in ((2, request), (3, response)):
                if value != int(value) or not 0 <= value <= MAX_REQUEST_TOKENS:
                    raise src.error(line, f"{BURSTGPT_COLUMNS[column]}={show(fields[column])} must be a "
                                    "whole number of tokens in [0, 2**40]")
            rows.append((stamp, int(request), int(response)))
    except csv.Error as e:
        raise src.error(reader.line_num, f"not valid CSV: {e}") from None
    if not rows:
        raise UserInputError(f"{p}: no GPT-4 row with Response tokens > 0 (the rows vllm bench serve keeps)")
    return rows


def _number(src: Source, line: int, column: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise src.error(line, f"{column}={show(text)} is not a number") from None
    if not math.isfinite(value):
        raise src.error(line, f"{column}={show(text)} is not a finite number")
    return value


def _server_len(tokenizer: TextTokenizer, index: int, input_len: int) -> int:
    # vLLM sends the text of token ids (index + j) % vocab_size; the server
    # encodes that text again, with the special tokens.
    if not tokenizer.exact:
        return input_len + tokenizer.num_special_tokens_to_add
    vocab = tokenizer.vocab_size
    return tokenizer.count(tokenizer.decode([(index + j) % vocab for j in range(input_len)]))


def sample_burstgpt(path: str | Path, tokenizer: TextTokenizer, num_requests: int,
                    seed: int) -> list[BenchSample]:
    """vLLM's BurstGPT sampling: ``num_requests`` of the kept rows drawn as
    pandas' ``DataFrame.sample(n, random_state=seed)`` draws them (numpy's
    ``RandomState(seed).choice``, with replacement when more rows are asked
    than kept); each prompt ``Request tokens`` long (its server length: the
    text vLLM makes of that many token ids, encoded again)."""
    import numpy as np

    rows = read_burstgpt(path)
    picks = np.random.RandomState(seed).choice(len(rows), size=num_requests,
                                               replace=num_requests > len(rows)).tolist()
    samples = []
    for i, row in enumerate(picks):
        _, request, response = rows[row]
        samples.append(BenchSample(str(i), request, response, _server_len(tokenizer, i, request)))
    return samples


def burstgpt_timed(path: str | Path, tokenizer: TextTokenizer,
                   num_requests: int | None) -> tuple[list[BenchSample], list[float]]:
    """The kept rows in file order at their own ``Timestamp`` (seconds from
    the first row's): the trace replayed, not sampled (a kvsched option;
    vllm bench serve always samples). The first ``num_requests`` rows, or all."""
    rows = read_burstgpt(path)
    if num_requests is not None:
        rows = rows[:num_requests]
    t0 = rows[0][0]
    times = []
    for stamp, _, _ in rows:
        if stamp < t0 or stamp - t0 > MAX_ARRIVAL_TIME:
            raise UserInputError(f"--dataset-path={path}: Timestamp {stamp:g} is before the first row's "
                                 f"or more than {MAX_ARRIVAL_TIME:.0e} s after it; the trace must be in "
                                 "time order")
        times.append(stamp - t0)
    samples = [BenchSample(str(i), request, response, _server_len(tokenizer, i, request))
               for i, (_, request, response) in enumerate(rows)]
    return samples, times
