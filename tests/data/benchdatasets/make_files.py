"""Writes the small local dataset files and the tokenizer the benchmark-dataset
goldens use (run once with kvsched's venv; the outputs are committed).

Text comes from sonnet.txt (Shakespeare, public domain), cut and repeated so
that lengths vary and some ShareGPT rows fall outside vLLM's filter (prompts
over 1024 tokens, outputs under 4)."""

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = Path(__file__).parent
LINES = (HERE / "sonnet.txt").read_text(encoding="utf-8").splitlines()


def text(rng: random.Random, n_lines: int) -> str:
    return " ".join(rng.choice(LINES) for _ in range(n_lines))


def make_tokenizer() -> None:
    out = HERE / "tokenizer"
    out.mkdir(exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(LINES * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 0)])
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
        "add_bos_token": True, "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": ("{% for message in messages %}<|{{ message['role'] }}|>\n"
                          "{{ message['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}, indent=2) + "\n")


def make_sharegpt(rng: random.Random) -> None:
    rows = []
    for i in range(40):
        turns = 1 if i % 13 == 5 else 2 + i % 3
        conv = []
        for t in range(turns):
            n = rng.choice([1, 2, 3, 5, 8, 20]) if i % 11 != 7 else 150  # some prompts too long
            if t == 1 and i % 9 == 4:
                conv.append({"from": "gpt", "value": "Yes."})  # output under 4 tokens
                continue
            conv.append({"from": "human" if t % 2 == 0 else "gpt", "value": text(rng, n)})
        rows.append({"id": f"conv{i}", "conversations": conv})
    rows.append({"id": "noconv"})
    (HERE / "sharegpt.json").write_text(json.dumps(rows, indent=1) + "\n")


def make_burstgpt(rng: random.Random) -> None:
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    t = 0
    for i in range(60):
        t += rng.choice([0, 1, 2, 5, 13])
        model = "GPT-4" if i % 3 else "ChatGPT"
        req = rng.randint(1, 900)
        resp = 0 if i % 17 == 3 else rng.randint(1, 400)
        lines.append(f"{t},{model},{req},{resp},{req + resp},{'Conversation log' if i % 2 else 'API log'}")
    (HERE / "burstgpt.csv").write_text("\n".join(lines) + "\n")


def make_custom(rng: random.Random) -> None:
    out = []
    for _ in range(25):
        row = {"prompt": text(rng, rng.choice([1, 2, 4, 7]))}
        row["output_tokens"] = rng.randint(1, 300)
        out.append(json.dumps(row))
    (HERE / "custom.jsonl").write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    make_tokenizer()
    r = random.Random(2026)
    make_sharegpt(r)
    make_burstgpt(r)
    make_custom(r)
