"""Incremental detokenization and stop strings (vLLM's detokenizer, rebuilt).

Token text is produced as tokens arrive: a character whose UTF-8 bytes span
several tokens appears once its last byte has arrived, never as U+FFFD. Stop
strings are searched for only in the text the latest tokens added (plus the
few characters before it that a stop string could span).
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path
from typing import Protocol

import tokenizers
import tokenizers.decoders

from kvsched.errors import UserInputError
from kvsched.request import SamplingParams

# Older tokenizers lack DecodeStream: the Python ReadOffsetStream below does it.
HAS_DECODE_STREAM = hasattr(tokenizers.decoders, "DecodeStream")

# Prompt tokens replayed into a fresh stream: enough for a character split
# between prompt and output (up to 3 pending bytes) and for decoders whose
# output depends on the preceding token (a leading-space marker).
PROMPT_CONTEXT_TOKENS = 5


def load_tokenizer(path: str | os.PathLike[str]) -> tokenizers.Tokenizer:
    """The tokenizer of a checkpoint directory (its tokenizer.json) or of a
    tokenizer.json file."""
    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise UserInputError(f"tokenizer path={str(file)!r}: no such file; the checkpoint needs a "
                         "tokenizer.json (the fast-tokenizer format of the tokenizers package)")
    try:
        return tokenizers.Tokenizer.from_file(str(file))
    except Exception as e:  # the Rust side raises plain Exception on bad JSON
        raise UserInputError(f"tokenizer path={str(file)!r}: not a valid tokenizer.json ({e}); "
                         "re-export it with a recent tokenizers/transformers") from None


class TokenStream(Protocol):
    def step(self, tokenizer: tokenizers.Tokenizer, id: int) -> str | None: ...


class ReadOffsetStream:
    """Incremental decoding with a prefix and a read offset: decode the tokens
    from the prefix offset twice, with and without the newest ones, and emit
    the difference once it no longer ends in an incomplete character."""

    def __init__(self, skip_special_tokens: bool) -> None:
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # ids before this are decoded and forgotten
        self.read_offset = 0  # ids before this have had their text emitted

    def step(self, tokenizer: tokenizers.Tokenizer, id: int) -> str | None:
        self.ids.append(id)
        skip = self.skip_special_tokens
        prefix = tokenizer.decode(self.ids[self.prefix_offset:self.read_offset], skip_special_tokens=skip)
        text = tokenizer.decode(self.ids[self.prefix_offset:], skip_special_tokens=skip)
        if len(text) <= len(prefix) or text.endswith("\ufffd"):
            return None
        # Keep only the ids still needed as decoding context.
        del self.ids[:self.prefix_offset]
        self.prefix_offset = self.read_offset - self.prefix_offset
        self.read_offset = len(self.ids)
        return text[len(prefix):]


class IncrementalDetokenizer:
    """One request's output text, grown token by token, cut at stop strings."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, prompt_token_ids: list[int],
                 params: SamplingParams, use_decode_stream: bool = True) -> None:
        self.tokenizer = tokenizer
        self.stop = params.stop
        self.include_stop_str_in_output = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens
        self.skip_special_tokens = params.skip_special_tokens
        self.output_text = ""
        self.num_output_tokens = 0
        # The stop string that ended the text, once one has.
        self.stop_reason: str | None = None
        # Of the tokens the last update() was given, how many belong to the output.
        self.num_kept = 0
        self._stop_end = 0
        self._use_decode_stream = use_decode_stream and HAS_DECODE_STREAM
        self._recent_ids = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._stream = self._new_stream(self._recent_ids)

    def _new_stream(self, context_ids: list[int]) -> TokenStream:
        if self._use_decode_stream:
            try:
                return self._primed(
                    tokenizers.decoders.DecodeStream(skip_special_tokens=self.skip_special_tokens),
                    context_ids)
            except Exception:
                self._use_decode_stream = False  # see _step
        return self._primed(ReadOffsetStream(self.skip_special_tokens), context_ids)

    def _primed(self, stream: TokenStream, context_ids: list[int]) -> TokenStream:
        for t in context_ids:  # their text is already known: drop it
            stream.step(self.tokenizer, t)
        return stream

    def _step(self, token_id: int) -> str | None:
        try:
            piece = self._stream.step(self.tokenizer, token_id)
        except Exception:
            # DecodeStream refuses text that does not extend the previous
            # decode ("Invalid prefix"), which some decoders produce; the
            # Python stream slices by length instead.
            self._use_decode_stream = False
            self._stream = self._new_stream(self._recent_ids)
            piece = self._stream.step(self.tokenizer, token_id)
        self._recent_ids.append(token_id)
        del self._recent_ids[:-PROMPT_CONTEXT_TOKENS]
        return piece

    def update(self, new_token_ids: list[int], stop_terminated: bool = False) -> str | None:
        """Append the new tokens' text; return the stop string that ends the
        output (the text is cut before it, or after it with
        include_stop_str_in_output) or None.

        ``stop_terminated``: the last token is EOS or a stop token id; like
        vLLM its text is left out unless include_stop_str_in_output.

        ``num_kept`` then says how many of the new tokens belong to the
        output: all of them, unless a stop string ended it at an earlier one
        (a step with accepted drafts appends several tokens; like vLLM 0.33,
        those after the one completing the stop string are dropped).
        """
        self.num_kept = len(new_token_ids)
        if self.stop_reason is not None:
            self.num_kept = 0
            return None  # finished: nothing more belongs to the output
        decode_ids = new_token_ids
        if stop_terminated and not self.include_stop_str_in_output:
            decode_ids = new_token_ids[:-1]
        # Like vLLM, stop strings count only in the text of tokens after the
        # first min_tokens: the search starts at check_from.
        check_from = len(self.output_text)
        # The text's length after each new token (the first: before them).
        offsets = [check_from]
        for token_id in decode_ids:
            self.num_output_tokens += 1
            piece = self._step(token_id)
            if piece:
                self.output_text += piece
            if self.num_output_tokens <= self.min_tokens:
                check_from = len(self.output_text)
            offsets.append(len(self.output_text))
        self.num_output_tokens += len(new_token_ids) - len(decode_ids)
        if not self.stop or len(self.output_text) == check_from:
            return None
        stop = self._check_stop_strings(check_from)
        if stop is not None:
            # The first token whose text reaches the stop string's end.
            self.num_kept = max(1, bisect.bisect_left(offsets, self._stop_end, lo=1))
        return stop

    def _check_stop_strings(self, check_from: int) -> str | None:
        text = self.output_text
        best: tuple[int, int, str] | None = None
        for stop in self.stop:
            # A match ends after check_from, so starts at most len - 1 before it.
            start = text.find(stop, max(0, check_from - len(stop) + 1))
            if start == -1:
                continue
            # The stop string completed first wins (what a character-by-
            # character stream would see); on a tie, the first in the list (vLLM).
            end = start + len(stop)
            if best is None or end < best[0]:
                best = (end, start, stop)
        if best is None:
            return None
        end, start, stop = best
        self._stop_end = end
        self.output_text = text[:end] if self.include_stop_str_in_output else text[:start]
        self.stop_reason = stop
        return stop
