"""One process of the FSDP2-on-CPU checkpoint check (tests/test_distributed.py).

``python -m torch.distributed.run --nproc_per_node 2 tests/fsdp_run.py OUT STEPS [RESUME]``
(or plain ``python`` for one process). A 2-layer Qwen3 with tied embeddings is sharded with
``fully_shard`` (each decoder layer, then the root: what Accelerate's ``fsdp_version: 2``
configs apply on GPUs; Accelerate itself runs FSDP only on accelerators, torch runs it on
CPU over gloo). Update ``s`` trains on 4 sequences drawn from seed ``s``; process ``i`` of
``P`` takes sequences ``i::P`` (FSDP averages the processes' gradients: the mean loss
over all 4). With ``RESUME`` (a checkpoint folder) a model built from another seed loads it
first and continues from update ``STEPS_DONE`` (its ``state.json``).
Rank 0 writes ``OUT/model.safetensors``, ``OUT/optimizer.pt`` and ``OUT/state.json``
through :mod:`sera_core.utils.weights`; every process writes ``OUT/engine.<rank>.safetensors``,
the weights :func:`~sera_core.utils.weights.full_weights` gives it (what its rollout engine
would load).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, Qwen3Config

from sera_core.utils.weights import full_weights, load_optimizer_state, load_trained, optimizer_state, trained_state


def main(out: Path, steps: int, resume: Path | None) -> None:
    if "RANK" in __import__("os").environ:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, tie_word_embeddings=True)
    torch.manual_seed(1 if resume else 0)  # a resumed model starts from other weights: only the checkpoint counts
    model = AutoModelForCausalLM.from_config(cfg)
    if world > 1:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    start = 0
    if resume is not None:
        load_trained(model, resume / "model.safetensors")
        load_optimizer_state(model, optimizer, resume / "optimizer.pt")
        start = json.loads((resume / "state.json").read_text())["steps"]
    for s in range(start, start + steps):
        ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(s))[rank::world]
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    weights, moments = trained_state(model), optimizer_state(model, optimizer)  # every process: collectives
    engine = full_weights(model)  # every process: a collective, the full weights on each
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in engine.items() if k != "lm_head.weight"}, str(out / f"engine.{rank}.safetensors"))
    if rank == 0:
        save_file(weights, str(out / "model.safetensors"))
        torch.save(moments, out / "optimizer.pt")
        (out / "state.json").write_text(json.dumps({"steps": start + steps, "processes": world,
                                                    "sharded": type(next(model.parameters())).__name__ == "DTensor"}))
    if dist.is_initialized():
        dist.barrier()  # leave together: a process that tears gloo down while another still works may abort
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
