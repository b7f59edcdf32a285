"""transformers models called with token ids and an attention mask, as users call them, through
``torch.compile(model, backend="ollie")``: correctness on new ids, and time per call with new
ids at every call against eager and torch.compile's default backend, side by side.

    python benchmarks/integer_inputs.py [NAME ...] [--layers L --hidden H --seq S --rounds R]

``NAME``: one of :data:`NAMES` (default: all), built from a config
with random weights (seeded; ``--layers`` 2, ``--hidden`` 256 with 4 heads of 64, ``--seq`` 64,
batch 1), ``attn_implementation="eager"``. For each: the first compiled call's seconds (Ollie
optimises then; set ``OLLIE_CACHE_DIR`` to an empty directory for a cold figure), the largest
relative error over three calls with new ids (the mask's last quarter zero in the third), the
warnings Ollie logged, then the median milliseconds per call of eager, ``inductor`` and
``ollie`` over ``--rounds`` interleaved rounds (:func:`ollie.tune.measure.measure_alternating`),
each call with the next ids of one shared pool. Needs transformers (extra 'models').
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
import time
from collections.abc import Callable

import torch

import ollie  # noqa: F401 - registers the backend
from ollie.tune.measure import measure_alternating
from ollie.zoo.external import import_torchvision
from ollie.zoo.init import seeded

NAMES = ("bert", "roberta", "distilbert", "gpt2", "albert", "electra", "deberta", "t5enc")


def build(name: str, layers: int, hidden: int) -> torch.nn.Module:
    import_torchvision()  # transformers imports it: where its operators cannot load
    import transformers as tf

    heads = max(1, hidden // 64)
    common = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  intermediate_size=4 * hidden, attn_implementation="eager")
    makers: dict[str, Callable[[], torch.nn.Module]] = {
        "bert": lambda: tf.BertModel(tf.BertConfig(**common), add_pooling_layer=False),
        "roberta": lambda: tf.RobertaModel(tf.RobertaConfig(**common),
                                           add_pooling_layer=False),
        "distilbert": lambda: tf.DistilBertModel(tf.DistilBertConfig(
            dim=hidden, n_layers=layers, n_heads=heads, hidden_dim=4 * hidden,
            attn_implementation="eager")),
        "gpt2": lambda: tf.GPT2Model(tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads,
                                                   attn_implementation="eager")),
        "albert": lambda: tf.AlbertModel(tf.AlbertConfig(embedding_size=hidden, **common),
                                         add_pooling_layer=False),
        "electra": lambda: tf.ElectraModel(tf.ElectraConfig(embedding_size=hidden, **common)),
        "deberta": lambda: tf.DebertaV2Model(tf.DebertaV2Config(**common)),
        "t5enc": lambda: tf.T5EncoderModel(tf.T5Config(
            d_model=hidden, d_ff=4 * hidden, num_layers=layers, num_heads=heads, d_kv=64)),
    }
    with seeded(0):
        return makers[name]().eval()


def ids_pool(seq: int, n: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    pool = []
    for k in range(n):
        mask = torch.ones(1, seq, dtype=torch.long)
        if k % 3 == 2:
            mask[:, seq - seq // 4:] = 0
        pool.append((torch.randint(0, 1000, (1, seq), generator=gen), mask))
    return pool


def hidden(model: Callable, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, attention_mask=mask).last_hidden_state


def row(name: str, args: argparse.Namespace, log: list[str]) -> str:
    model = build(name, args.layers, args.hidden)
    pool = ids_pool(args.seq)
    torch._dynamo.reset()
    ollie_c = torch.compile(model, backend="ollie")
    first = len(log)
    with torch.no_grad():
        t = time.perf_counter()
        hidden(ollie_c, *pool[0])
        cold = time.perf_counter() - t
        err = max(float((hidden(ollie_c, *p) - (w := hidden(model, *p))).abs().max()
                        / w.abs().max()) for p in pool[1:4])
        inductor = torch.compile(model)
        hidden(inductor, *pool[0])
        fns = {}
        for label, fn in (("eager", model), ("inductor", inductor), ("ollie", ollie_c)):
            it = itertools.cycle(pool)
            fns[label] = lambda fn=fn, it=it: hidden(fn, *next(it))
        med = measure_alternating(fns, "cpu", rounds=args.rounds, min_sample=0.02)
    warned = len(log) - first
    return (f"| {name} | {cold:.1f} | {err:.1e} | {warned} | " +
            " | ".join(f"{med[k] * 1e3:.2f}" for k in ("eager", "inductor", "ollie")) +
            f" | {med['eager'] / med['ollie']:.2f}x | {med['inductor'] / med['ollie']:.2f}x |")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", default=list(NAMES))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    log: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            log.append(record.getMessage())

    logging.getLogger("ollie").addHandler(Keep(logging.WARNING))
    print(f"layers {args.layers}, hidden {args.hidden}, seq {args.seq}, batch 1, "
          f"{torch.get_num_threads()} threads; ms per call, new ids each call")
    print("| model | first call s | rel err (new ids) | Ollie warnings | eager ms | "
          "inductor ms | ollie ms | vs eager | vs inductor |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.names:
        try:
            print(row(name, args, log), flush=True)
        except Exception as exc:  # reported; the next model still runs
            print(f"| {name} | FAILED {type(exc).__name__}: {str(exc)[:200]} |", flush=True)
    for msg in log:
        print("warning:", msg[:300])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
