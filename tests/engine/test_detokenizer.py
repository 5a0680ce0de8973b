"""IncrementalDetokenizer and load_tokenizer, on a byte-level BPE trained here."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

tokenizers = pytest.importorskip("tokenizers")

from kvsched.engine.detokenizer import IncrementalDetokenizer, load_tokenizer  # noqa: E402
from kvsched.request import SamplingParams  # noqa: E402

CORPUS = [
    "The café on the corner serves naïve coffee ☕ and crème brûlée.",
    "日本語のテキストも少し。東京は大きい。",
    "Emoji time: 😀🎉🚀 and more 😀!",
    "Hello world, hello again. The quick brown fox jumps over the lazy dog.",
]
SPECIALS = ["<s>", "</s>", "<pad>"]
BOTH_STREAMS = pytest.mark.parametrize("use_decode_stream", [True, False],
                                       ids=["DecodeStream", "read-offset"])


@pytest.fixture(scope="module")
def tok() -> tokenizers.Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t.train_from_iterator(CORPUS * 5, trainer)
    return t


def _stream(tok: tokenizers.Tokenizer, ids: list[int], params: SamplingParams | None = None,
            prompt: str = "Say: ", chunk: int = 1, use_decode_stream: bool = True
            ) -> tuple[IncrementalDetokenizer, list[str], str | None]:
    d = IncrementalDetokenizer(tok, tok.encode(prompt).ids, params or SamplingParams(),
                               use_decode_stream=use_decode_stream)
    texts, hit = [], None
    for i in range(0, len(ids), chunk):
        hit = d.update(ids[i:i + chunk])
        texts.append(d.output_text)
        if hit is not None:
            break
    return d, texts, hit


def _random_text(rng: random.Random) -> str:
    words = [*" ".join(CORPUS).split(), "Ω", "ß", "🦀", "한국어", "ü", "e\u0301"]
    return " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))


@BOTH_STREAMS
def test_incremental_text_equals_decoding_all_ids(tok: tokenizers.Tokenizer,
                                                  use_decode_stream: bool) -> None:
    rng = random.Random(0)
    for _ in range(150):
        ids = tok.encode(_random_text(rng)).ids
        d, _, _ = _stream(tok, ids, chunk=rng.randint(1, 4), use_decode_stream=use_decode_stream)
        assert d.output_text == tok.decode(ids)


@BOTH_STREAMS
def test_random_id_streams_give_a_prefix_of_the_full_decode(tok: tokenizers.Tokenizer,
                                                           use_decode_stream: bool) -> None:
    # Arbitrary ids may end inside a character (or never complete one): the
    # text is then held back, so it is a prefix; otherwise the whole decode.
    rng = random.Random(1)
    vocab = tok.get_vocab_size()
    complete = 0
    for _ in range(300):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 25))]
        skip = rng.random() < 0.5
        full = tok.decode(ids, skip_special_tokens=skip)
        d, _, _ = _stream(tok, ids, SamplingParams(skip_special_tokens=skip), chunk=rng.randint(1, 3),
                          use_decode_stream=use_decode_stream)
        assert full.startswith(d.output_text)
        if not full.endswith("\ufffd"):
            assert d.output_text == full
            complete += 1
    assert complete > 100


@BOTH_STREAMS
def test_split_multibyte_characters_never_show_replacement_chars(tok: tokenizers.Tokenizer,
                                                                 use_decode_stream: bool) -> None:
    text = "naïve café 😀🎉 東京は大きい 🦀 한국어"
    ids = tok.encode(text).ids
    # The test exercises splits: some tokens alone are not valid UTF-8.
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    _, texts, _ = _stream(tok, ids, use_decode_stream=use_decode_stream)
    for partial in texts:
        assert "\ufffd" not in partial
        assert text.startswith(partial)
    assert texts[-1] == text


def _spans_tokens(tok: tokenizers.Tokenizer, text: str, stop: str) -> bool:
    return not any(stop in tok.decode([i]) for i in tok.encode(text).ids)


@BOTH_STREAMS
@pytest.mark.parametrize("include", [False, True])
def test_stop_string_across_token_boundaries_truncates(tok: tokenizers.Tokenizer, include: bool,
                                                       use_decode_stream: bool) -> None:
    text = "The café on the corner serves coffee"
    stop = "é on th"
    assert _spans_tokens(tok, text, stop)
    params = SamplingParams(stop=[stop], include_stop_str_in_output=include)
    d, _, hit = _stream(tok, tok.encode(text).ids, params, use_decode_stream=use_decode_stream)
    assert hit == stop
    assert d.stop_reason == stop
    assert d.output_text == ("The café on th" if include else "The caf")


def test_stop_string_in_a_multi_token_update(tok: tokenizers.Tokenizer) -> None:
    text = "Hello world, hello again. The quick brown fox"
    params = SamplingParams(stop="again")
    d, _, hit = _stream(tok, tok.encode(text).ids, params, chunk=100)
    assert (hit, d.output_text) == ("again", "Hello world, hello ")


@pytest.mark.parametrize("include", [False, True])
def test_num_kept_counts_the_tokens_up_to_the_one_completing_the_stop(
        tok: tokenizers.Tokenizer, include: bool) -> None:
    """One update with several tokens (accepted drafts): like vLLM 0.33, the
    tokens after the one that completes the stop string are not output."""
    text = "Hello world, hello again. The quick brown fox"
    ids = tok.encode(text).ids
    # The token whose text completes "again".
    last = next(i for i in range(len(ids)) if "again" in tok.decode(ids[:i + 1]))
    d = IncrementalDetokenizer(tok, [], SamplingParams(stop="again", include_stop_str_in_output=include))
    d.update(ids[:2])
    assert d.num_kept == 2
    assert d.update(ids[2:]) == "again"
    assert d.num_kept == last + 1 - 2
    assert d.output_text == ("Hello world, hello again" if include else "Hello world, hello ")
    assert d.update(ids[:3]) is None and d.num_kept == 0  # finished: nothing more is output


@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_the_earliest_completed_stop_string_wins(tok: tokenizers.Tokenizer, chunk: int) -> None:
    text = "Hello world, hello again. The quick brown fox"
    # List order does not matter: "world" completes first.
    d, _, hit = _stream(tok, tok.encode(text).ids, SamplingParams(stop=("again", "quick", "world")),
                        chunk=chunk)
    assert (hit, d.output_text) == ("world", "Hello ")
    # Overlapping stops: "lo w" completes before "hello world" could.
    d, _, hit = _stream(tok, tok.encode(text).ids, SamplingParams(stop=("Hello world", "lo w")),
                        chunk=chunk)
    assert (hit, d.output_text) == ("lo w", "Hel")


@pytest.mark.parametrize("chunk", [1, 100])
def test_stop_strings_completed_together_go_by_list_order(tok: tokenizers.Tokenizer, chunk: int) -> None:
    # "lo world" and "world" complete at the same character: like vLLM, the
    # one listed first wins, whichever starts first.
    ids = tok.encode("Hello world, hello again").ids
    d, _, hit = _stream(tok, ids, SamplingParams(stop=("world", "lo world")), chunk=chunk)
    assert (hit, d.output_text) == ("world", "Hello ")
    d, _, hit = _stream(tok, ids, SamplingParams(stop=("lo world", "world")), chunk=chunk)
    assert (hit, d.output_text) == ("lo world", "Hel")


def test_no_stop_string_keeps_everything(tok: tokenizers.Tokenizer) -> None:
    text = "The quick brown fox jumps"
    d, _, hit = _stream(tok, tok.encode(text).ids, SamplingParams(stop=["lazy", "dog"]))
    assert hit is None and d.stop_reason is None
    assert d.output_text == text


def test_updates_after_a_stop_change_nothing(tok: tokenizers.Tokenizer) -> None:
    ids = tok.encode("Hello world, hello again").ids
    d = IncrementalDetokenizer(tok, [], SamplingParams(stop=["world"]))
    assert d.update(ids) == "world"
    assert d.update(tok.encode(" more text").ids) is None
    assert d.output_text == "Hello "


def test_stop_strings_do_not_count_within_min_tokens(tok: tokenizers.Tokenizer) -> None:
    ids = tok.encode("Hello world, hello world again").ids
    first_world = next(n for n in range(1, len(ids) + 1) if "world" in tok.decode(ids[:n]))
    # Within min_tokens the first "world" is ignored; the second one stops.
    params = SamplingParams(stop=["world"], min_tokens=first_world)
    d, _, hit = _stream(tok, ids, params)
    assert (hit, d.output_text) == ("world", "Hello world, hello ")
    d, _, hit = _stream(tok, ids, SamplingParams(stop=["world"], min_tokens=first_world - 1))
    assert (hit, d.output_text) == ("world", "Hello ")


@pytest.mark.parametrize("skip", [True, False])
def test_skip_special_tokens(tok: tokenizers.Tokenizer, skip: bool) -> None:
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    ids = [bos, *tok.encode("café").ids, eos, *tok.encode(" hello").ids]
    d, _, _ = _stream(tok, ids, SamplingParams(skip_special_tokens=skip))
    assert d.output_text == ("café hello" if skip else "<s>café</s> hello")


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_terminated_tokens_text_is_left_out(tok: tokenizers.Tokenizer, include: bool) -> None:
    ids = tok.encode("Hello world").ids
    params = SamplingParams(include_stop_str_in_output=include, skip_special_tokens=False)
    d = IncrementalDetokenizer(tok, [], params)
    d.update(ids[:-1])
    assert d.update(ids[-1:], stop_terminated=True) is None
    assert d.output_text == ("Hello world" if include else tok.decode(ids[:-1]))
    assert d.num_output_tokens == len(ids)


def test_a_prompt_is_context_not_output(tok: tokenizers.Tokenizer) -> None:
    ids = tok.encode(" again 😀").ids
    d, _, _ = _stream(tok, ids, prompt="Hello world, hello")
    assert d.output_text == " again 😀"


@BOTH_STREAMS
def test_prompt_context_keeps_the_leading_space_of_sentencepiece_style_tokens(
        use_decode_stream: bool) -> None:
    # A Metaspace decoder drops the space marker of a sequence's first token;
    # the output continues the prompt, so its first word keeps its space.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Metaspace()
    t.decoder = decoders.Metaspace()
    t.train_from_iterator(CORPUS * 5, trainers.BpeTrainer(vocab_size=200, special_tokens=SPECIALS,
                                                          show_progress=False))
    prompt, output = t.encode("Hello").ids, t.encode(" world, hello again").ids
    full = t.decode(prompt + output)
    assert full == "Hello world, hello again" and t.decode(output) == "world, hello again"
    d = IncrementalDetokenizer(t, prompt, SamplingParams(), use_decode_stream=use_decode_stream)
    for i in output:
        d.update([i])
    assert d.output_text == " world, hello again"


class _FailingStream:
    """A DecodeStream stand-in that refuses its third token, as DecodeStream
    does ("Invalid prefix encountered") for some decoders."""

    def __init__(self) -> None:
        self.steps = 0

    def step(self, tokenizer: tokenizers.Tokenizer, id: int) -> str | None:
        self.steps += 1
        if self.steps == 3:
            raise Exception("Invalid prefix encountered")
        return None


class _DetokenizerWithFailingStream(IncrementalDetokenizer):
    def _new_stream(self, context_ids: list[int]):  # type: ignore[no-untyped-def]
        return _FailingStream() if self._use_decode_stream else super()._new_stream(context_ids)


def test_a_failing_decode_stream_falls_back_to_the_read_offset_stream(
        tok: tokenizers.Tokenizer) -> None:
    ids = tok.encode(" café 😀 東京").ids
    d = _DetokenizerWithFailingStream(tok, [], SamplingParams())
    for i in ids:
        d.update([i])
    # The first two tokens' text is lost with the failing stand-in; the rest
    # comes from the fallback, which replays the recent ids as context.
    assert d.output_text == tok.decode(ids)[len(tok.decode(ids[:2])):]


def test_load_tokenizer(tok: tokenizers.Tokenizer, tmp_path: Path) -> None:
    tok.save(str(tmp_path / "tokenizer.json"))
    for path in (tmp_path, tmp_path / "tokenizer.json", str(tmp_path)):
        loaded = load_tokenizer(path)
        assert loaded.encode("naïve café").ids == tok.encode("naïve café").ids
    missing = tmp_path / "nothing"
    with pytest.raises(ValueError, match=r"nothing.*tokenizer\.json"):
        load_tokenizer(missing)
    missing.mkdir()
    with pytest.raises(ValueError, match=r"nothing/tokenizer\.json.*needs a tokenizer\.json"):
        load_tokenizer(missing)
    (missing / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"not a valid tokenizer\.json"):
        load_tokenizer(missing)
