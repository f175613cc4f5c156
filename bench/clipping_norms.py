"""Cost and accuracy of GhostClipper on a small tied GPT-2, against a plain backward and torch.func.

    .venv/bin/python bench/clipping_norms.py [--layers 4] [--hidden 128] [--vocab 2000] [--seq 64]
                                             [--batch 8] [--repeats 5] [--device cpu]

Prints median wall times of: forward + plain backward of the mean loss (no privacy), forward +
GhostClipper.clipped_backward, and per-example gradients by torch.func (vmap over grad); and the
largest relative error of the ghost norms against torch.func.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch.func import functional_call, grad, vmap
from transformers import GPT2Config, GPT2LMHeadModel

from hush_hf.clipping import GhostClipper, example_cross_entropy


def timed(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=args.vocab, n_embd=args.hidden, n_layer=args.layers, n_head=4, n_positions=args.seq,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        attn_implementation="eager",
    )  # fmt: skip
    model = GPT2LMHeadModel(config).to(device).train()
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)
    batch = {"input_ids": ids, "position_ids": torch.arange(args.seq, device=device).expand_as(ids)}

    def loss_of(out: object) -> torch.Tensor:
        return example_cross_entropy(out.logits, ids, causal=True)

    def plain() -> None:
        model.zero_grad(set_to_none=True)
        loss_of(model(**batch)).mean().backward()

    params = {n: p.detach() for n, p in model.named_parameters()}

    def selected(p: dict[str, torch.Tensor], sel: torch.Tensor) -> torch.Tensor:
        return (loss_of(functional_call(model, p, (), batch)) * sel).sum()

    def reference() -> dict[str, torch.Tensor]:
        return vmap(grad(selected), in_dims=(None, 0))(params, torch.eye(args.batch, device=device))

    t_plain = timed(plain, args.repeats, device)
    t_func = timed(reference, args.repeats, device)
    expected = torch.sqrt(sum(g.flatten(1).double().pow(2).sum(1) for g in reference().values()))
    with GhostClipper(model, max_norm=1.0) as clipper:

        def ghost() -> None:
            model.zero_grad(set_to_none=True)
            clipper.clipped_backward(loss_of(model(**batch)))

        t_ghost = timed(ghost, args.repeats, device)
        norms = clipper.per_example_norms(loss_of(model(**batch)))
    err = float(((norms - expected).abs() / expected).max())
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"GPT-2 {args.layers}x{args.hidden}, vocab {args.vocab}, {n_params / 1e6:.2f}M params (tied), "
        f"batch {args.batch} x seq {args.seq}, {device}, torch threads {torch.get_num_threads()}"
    )
    print(f"  forward + plain backward      {t_plain * 1e3:8.1f} ms")
    print(f"  forward + clipped_backward    {t_ghost * 1e3:8.1f} ms  ({t_ghost / t_plain:.2f}x)")
    print(f"  torch.func per-example grads  {t_func * 1e3:8.1f} ms  ({t_func / t_plain:.2f}x)")
    print(f"  max relative error of ghost norms vs torch.func: {err:.2e}")


if __name__ == "__main__":
    main()
