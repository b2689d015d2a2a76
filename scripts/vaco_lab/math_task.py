"""
A grade-school-style math task that runs anywhere: generated word problems with an exact-answer reward,
a word/digit-level tokenizer and a tiny causal LM built from a config (no downloads), a supervised warm-up
and an accuracy evaluation (greedy, or sampled pass@1). The reward and evaluation also apply to GSM8K from a local file.
"""

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch as th
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

Problem = dict[str, str]

_NAMES = ("ann", "bob", "cat", "dan", "eve", "fay", "gus", "hal")
_ITEMS = ("apples", "books", "coins", "cards", "eggs", "pens")
# (template, operation); {a}, {b}, {c} are numbers, {x}/{y} names, {item} an item.
_TEMPLATES: tuple[tuple[str, str], ...] = (
    ("{x} has {a} {item} . {y} gives {x} {b} more . how many {item} does {x} have ?", "a+b"),
    ("{x} has {a} {item} and gives {b} to {y} . how many {item} does {x} have now ?", "a-b"),
    ("{x} buys {a} boxes of {b} {item} . how many {item} in total ?", "a*b"),
    ("{x} has {a} {item} , buys {b} more and loses {c} . how many {item} are left ?", "a+b-c"),
)
_SPECIAL = ("<pad>", "<unk>", "<bos>", "<eos>")
_WORDS = (
    "has gives more how many does have and to now buys boxes of in total , loses are left ? . "
    "question answer : the is #### - + * ="
).split()


def build_tokenizer() -> PreTrainedTokenizerFast:
    """
    A word-level tokenizer over the task's words, with every digit its own token, built locally.
    Decoding joins tokens with spaces (``"1 2"`` for 12); :func:`extract_answer` reads numbers either way.
    """
    vocab_list = [*_SPECIAL, *(str(d) for d in range(10)), *_NAMES, *_ITEMS, *_WORDS]
    vocab = {token: i for i, token in enumerate(dict.fromkeys(vocab_list))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_length: int = 64,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A randomly initialized Llama-architecture causal LM built from a config (no pretrained weights)."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_length,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    th.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def _word_problem(rng: random.Random, max_number: int) -> Problem:
    template, operation = rng.choice(_TEMPLATES)
    x, y = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    if operation == "a*b":
        a, b, c = rng.randint(1, min(9, max_number)), rng.randint(1, min(9, max_number)), 0
        answer = a * b
    elif operation == "a-b":
        a = rng.randint(1, max_number)
        b, c = rng.randint(0, a), 0
        answer = a - b
    elif operation == "a+b":
        a, b, c = rng.randint(0, max_number), rng.randint(0, max_number), 0
        answer = a + b
    else:  # a+b-c
        a, b = rng.randint(0, max_number), rng.randint(0, max_number)
        c = rng.randint(0, a + b)
        answer = a + b - c
    question = template.format(x=x, y=y, item=item, a=a, b=b, c=c)
    return {"prompt": f"{question} answer :", "answer": str(answer)}


def make_word_problems(n: int, seed: int, max_number: int = 20) -> list[Problem]:
    """
    ``n`` grade-school-style word problems (addition, subtraction, multiplication of factors up to
    ``min(9, max_number)``, and two steps),
    each ``{"prompt": "... answer :", "answer": "17"}``, drawn with their own RNG.
    """
    rng = random.Random(seed)
    return [_word_problem(rng, max_number) for _ in range(n)]


def load_gsm8k(path: str | Path, limit: int | None = None) -> list[Problem]:
    """
    GSM8K-format problems from a local ``.jsonl`` / ``.json`` / ``.parquet`` file or a directory saved with
    ``datasets.Dataset.save_to_disk``: rows with ``question`` and ``answer`` (the final number after ``####``).
    Prompts end with ``"\\nAnswer:"``; the gold answer keeps only the final number.
    """
    path = Path(path)
    rows: Sequence[dict[str, Any]]
    if path.is_dir():
        from datasets import load_from_disk

        rows = list(load_from_disk(str(path)))
    elif path.suffix == ".parquet":
        from datasets import Dataset

        rows = list(Dataset.from_parquet(str(path)))
    elif path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:
        rows = json.loads(path.read_text())
    problems = []
    for row in rows[:limit]:
        gold = extract_answer(str(row["answer"]))
        if gold is not None:
            problems.append({"prompt": f"Question: {row['question']}\nAnswer:", "answer": gold})
    return problems


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def extract_answer(text: str) -> str | None:
    """
    The final answer in a completion: the first number after ``####`` if there is one, else the last number.
    Digits separated by single spaces (the toy tokenizer's decoding) are joined; thousands commas are dropped.
    """
    text = re.sub(r"(?<=\d) (?=\d)", "", text).replace(",", "")
    if "####" in text:
        numbers = _NUMBER.findall(text.split("####", 1)[1])
        return _normalize(numbers[0]) if numbers else None
    numbers = _NUMBER.findall(text)
    return _normalize(numbers[-1]) if numbers else None


def _normalize(number: str) -> str:
    value = float(number)
    return str(int(value)) if value == int(value) else str(value)


def exact_answer_reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """TRL reward function: 1.0 when the completion's final number equals the gold answer, else 0.0."""
    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        rewards.append(float(extract_answer(text) == _normalize(gold)))
    return rewards


def _encode_sft(tokenizer: PreTrainedTokenizerBase, problem: Problem) -> tuple[list[int], int]:
    prompt_ids = tokenizer(problem["prompt"], add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(" " + problem["answer"], add_special_tokens=False)["input_ids"]
    return [*prompt_ids, *answer_ids, tokenizer.eos_token_id], len(prompt_ids)


def noisy_answer(answer: str, rng: random.Random) -> str:
    """A near miss of a numeric ``answer``: off by 1 or 2 either way, negative only if ``answer`` is."""
    value = float(answer)
    misses = [value + offset for offset in (-2, -1, 1, 2) if value + offset >= 0 or value < 0]
    return _normalize(str(rng.choice(misses)))


def supervised_warmup(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    steps: int,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    seed: int = 0,
    answer_noise: float = 0.0,
) -> list[float]:
    """
    A short supervised warm-up (cross-entropy on the answer and EOS tokens only, AdamW, linear decay), so
    that the RL phase starts with non-zero rewards. Returns the loss per step.

    :param answer_noise: probability that a demonstration shows its problem's near miss (:func:`noisy_answer`, one
        per problem) instead of the gold answer, drawn each time it is sampled: the model learns the arithmetic but
        not to be sure of it, as a pretrained model that has seen wrong worked answers
    """
    if not 0.0 <= answer_noise < 1.0:
        raise ValueError(f"answer_noise must be in [0, 1), got {answer_noise}")
    rng = random.Random(seed)
    if answer_noise > 0:
        noisy = [{**p, "answer": noisy_answer(p["answer"], rng)} for p in problems]
        encoded_noisy = [_encode_sft(tokenizer, problem) for problem in noisy]
    encoded = [_encode_sft(tokenizer, problem) for problem in problems]
    device = next(model.parameters()).device
    optimizer = th.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    scheduler = th.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / max(steps, 1))
    model.train()
    losses = []
    for _ in range(steps):
        indices = rng.sample(range(len(encoded)), min(batch_size, len(encoded)))
        batch = [encoded_noisy[i] if answer_noise > 0 and rng.random() < answer_noise else encoded[i] for i in indices]
        width = max(len(ids) for ids, _ in batch)
        input_ids = th.full((len(batch), width), tokenizer.pad_token_id, dtype=th.long)
        attention_mask = th.zeros_like(input_ids)
        labels = th.full_like(input_ids, -100)
        for row, (ids, prompt_length) in enumerate(batch):
            start = width - len(ids)  # left padding, as in generation
            input_ids[row, start:] = th.tensor(ids)
            attention_mask[row, start:] = 1
            labels[row, start + prompt_length :] = th.tensor(ids[prompt_length:])
        loss = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), labels=labels.to(device)).loss
        optimizer.zero_grad()
        loss.backward()
        th.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    model.eval()
    return losses


@th.no_grad()
def evaluate_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    max_new_tokens: int = 4,
    batch_size: int = 256,
    temperature: float = 0.0,
    samples: int = 1,
) -> float:
    """
    Exact-answer accuracy on ``problems``: greedy decoding (``temperature=0``), or the mean over ``samples``
    completions per problem sampled at ``temperature`` (pass@1). The model's training mode is restored.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0} if temperature > 0 else {"do_sample": False}
    repeated = [p for p in problems for _ in range(samples if temperature > 0 else 1)]
    correct = 0.0
    for start in range(0, len(repeated), batch_size):
        batch = repeated[start : start + batch_size]
        inputs = tokenizer([p["prompt"] for p in batch], return_tensors="pt", padding=True, add_special_tokens=False).to(
            device
        )
        outputs = model.generate(  # type: ignore[operator]
            **inputs,
            max_new_tokens=max_new_tokens,
            **sampling,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        texts = tokenizer.batch_decode(outputs[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        correct += sum(exact_answer_reward(texts, [p["answer"] for p in batch]))
    model.train(was_training)
    return correct / max(len(repeated), 1)
